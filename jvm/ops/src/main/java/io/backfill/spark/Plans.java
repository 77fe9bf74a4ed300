package io.backfill.spark;

import java.util.ArrayList;
import java.util.List;

import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.AttributeReference;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.ExpressionSet;
import org.apache.spark.sql.catalyst.expressions.SortOrder;
import org.apache.spark.sql.catalyst.plans.logical.Statistics;
import org.apache.spark.sql.catalyst.plans.physical.HashPartitioning;
import org.apache.spark.sql.catalyst.types.DataTypeUtils;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.connector.read.streaming.SparkDataStream;
import org.apache.spark.sql.execution.LogicalRDD;
import org.apache.spark.sql.types.StructType;

import scala.Option;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

/** What backfill's operators share: their rows as a Dataset that says it is spread by the task column. */
final class Plans {
  private Plans() {}

  /**
   * The rows as a Dataset of schema {@code out}, hash-partitioned by column {@code task} over
   * {@code partitions} Spark partitions (true of rows an operator computed partition by partition from rows
   * spread that way), so Spark does not shuffle them again for a grouping or a sort that starts with it.
   */
  static Dataset<Row> spreadByTask(SparkSession session, JavaRDD<InternalRow> rows, StructType out, int task,
                                   int partitions) {
    List<AttributeReference> attributes = CollectionConverters.asJava(DataTypeUtils.toAttributes(out));
    List<Expression> by = new ArrayList<>();
    by.add(attributes.get(task));
    List<Attribute> output = new ArrayList<>(attributes);
    Seq<Attribute> outputSeq = CollectionConverters.asScala(output).toSeq();
    Seq<SortOrder> noOrder = CollectionConverters.asScala(new ArrayList<SortOrder>()).toSeq();
    LogicalRDD plan = new LogicalRDD(outputSeq, rows.rdd(),
        new HashPartitioning(CollectionConverters.asScala(by).toSeq(), partitions), noOrder, false,
        Option.<SparkDataStream>empty(), session, Option.<Statistics>empty(), Option.<ExpressionSet>empty());
    return org.apache.spark.sql.classic.Dataset.ofRows(session, plan);
  }

  /** The positions of the named columns in the schema. */
  static int[] indexes(StructType schema, List<String> columns) {
    int[] at = new int[columns.size()];
    for (int i = 0; i < at.length; i++) {
      at[i] = schema.fieldIndex(columns.get(i));
    }
    return at;
  }
}
