package io.backfill.spark;

import java.util.ArrayList;
import java.util.List;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.expressions.aggregate.AggregateExpression;
import org.apache.spark.sql.catalyst.expressions.aggregate.Complete$;
import org.apache.spark.sql.catalyst.expressions.aggregate.Final$;
import org.apache.spark.sql.catalyst.expressions.aggregate.Partial$;
import org.apache.spark.sql.catalyst.rules.Rule;
import org.apache.spark.sql.execution.SparkPlan;
import org.apache.spark.sql.execution.aggregate.HashAggregateExec;

import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.AbstractFunction1;
import scala.runtime.AbstractPartialFunction;
import scala.runtime.BoxedUnit;

/**
 * One aggregation where Spark plans two over the same rows.
 *
 * <p>Spark plans every grouping as a partial aggregation, a shuffle, then a final one. When the rows are
 * spread by the grouping already (backfill's one pass groups by task, on rows its ordering spread by task),
 * there is no shuffle, and the final aggregation groups the partial one's output again in the same task: the
 * same groups twice, two hash maps of them in memory at once (at 100M records, 38M windows: both maps spilled
 * and fell back to sorting). This rule makes such a pair one aggregation that does both steps (Spark's
 * "complete" mode): same result, one map. A pair with a shuffle between them is left as it is.
 *
 * <p>Registered with {@code spark.sql.extensions=io.backfill.spark.OneStepAggregates} (backfill/session.py).
 */
public final class OneStepAggregates extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {
  @Override
  public BoxedUnit apply(SparkSessionExtensions extensions) {
    extensions.injectQueryStagePrepRule(new AbstractFunction1<SparkSession, Rule<SparkPlan>>() {
      @Override
      public Rule<SparkPlan> apply(SparkSession session) {
        return new Collapse();
      }
    });
    return BoxedUnit.UNIT;
  }

  /** The rule: a final hash aggregation directly over its partial one becomes one complete aggregation. */
  public static final class Collapse extends Rule<SparkPlan> {
    @Override
    public SparkPlan apply(SparkPlan plan) {
      return plan.transformUp(new AbstractPartialFunction<SparkPlan, SparkPlan>() {
        @Override
        public boolean isDefinedAt(SparkPlan node) {
          return collapsible(node);
        }

        @Override
        public SparkPlan apply(SparkPlan node) {
          return collapsible(node) ? collapse((HashAggregateExec) node) : node;
        }
      });
    }

    static boolean collapsible(SparkPlan node) {
      if (!(node instanceof HashAggregateExec) || !(((HashAggregateExec) node).child() instanceof HashAggregateExec)) {
        return false;
      }
      HashAggregateExec last = (HashAggregateExec) node;
      HashAggregateExec first = (HashAggregateExec) last.child();
      if (last.isStreaming() || first.isStreaming() || first.groupingExpressions().isEmpty()
          || first.aggregateExpressions().size() != last.aggregateExpressions().size()
          || first.groupingExpressions().size() != last.groupingExpressions().size()) {
        return false;
      }
      for (AggregateExpression e : CollectionConverters.asJava(first.aggregateExpressions())) {
        if (e.mode() != Partial$.MODULE$ || e.isDistinct()) {
          return false;
        }
      }
      List<AggregateExpression> finals = CollectionConverters.asJava(last.aggregateExpressions());
      List<AggregateExpression> partials = CollectionConverters.asJava(first.aggregateExpressions());
      for (int i = 0; i < finals.size(); i++) {
        // the final step of the same functions (same result ids), grouping by the partial step's groups
        if (finals.get(i).mode() != Final$.MODULE$ || !finals.get(i).resultId().equals(partials.get(i).resultId())) {
          return false;
        }
      }
      List<org.apache.spark.sql.catalyst.expressions.NamedExpression> lastGroups =
          CollectionConverters.asJava(last.groupingExpressions());
      List<org.apache.spark.sql.catalyst.expressions.NamedExpression> firstGroups =
          CollectionConverters.asJava(first.groupingExpressions());
      for (int i = 0; i < lastGroups.size(); i++) {
        if (!lastGroups.get(i).exprId().equals(firstGroups.get(i).exprId())) {
          return false;
        }
      }
      return true;
    }

    static SparkPlan collapse(HashAggregateExec last) {
      HashAggregateExec first = (HashAggregateExec) last.child();
      List<AggregateExpression> complete = new ArrayList<>();
      for (AggregateExpression e : CollectionConverters.asJava(first.aggregateExpressions())) {
        complete.add(e.copy(e.aggregateFunction(), Complete$.MODULE$, false, e.filter(), e.resultId()));
      }
      Seq<AggregateExpression> expressions = CollectionConverters.asScala(complete).toSeq();
      return new HashAggregateExec(last.requiredChildDistributionExpressions(), false, last.numShufflePartitions(),
          first.groupingExpressions(), expressions, last.aggregateAttributes(), 0, last.resultExpressions(),
          first.child());
    }
  }
}
